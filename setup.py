"""Packaging for asyncopt.

Exact, tested pins live in requirements.txt; install_requires below only states
the runtime dependencies with loose lower bounds so that the package installs
into other environments too.
"""
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

INSTALL_REQUIRES = [
    "numpy>=1.24",
    "scipy>=1.10",
    "numba>=0.58",
    "scikit-learn>=1.3",
    "threadpoolctl>=3.1",
]
# Optional: backend="mpi" and mpirun need mpi4py and an MPI (the mpich wheel);
# asyncopt.deep (the torch bridge) needs PyTorch; the rest of asyncopt needs neither.
EXTRAS_REQUIRE = {"mpi": ["mpi4py>=3.1", "mpich>=4"], "deep": ["torch>=2.4"]}

# ---------------------------------------------------------------------------
# C extension (native/): the C + OpenMP lock-free inner loop of Sha-DDSS.
# native/svrg.c is plain C (no Python C API): it is built as the shared library
# asyncopt/_native_svrg*.so and loaded with ctypes by asyncopt/kernels/native.py.
# It is optional: when no C compiler / OpenMP is available the build prints one
# warning and the install goes on without it (the numba kernels are used).
# ---------------------------------------------------------------------------
NATIVE_EXT = Extension(
    "asyncopt._native_svrg",
    sources=["native/svrg.c"],
    extra_compile_args=["-O2", "-fopenmp", "-ffp-contract=off"],
    extra_link_args=["-fopenmp"],
    optional=True,
)
EXT_MODULES = [NATIVE_EXT]


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install and exports no PyInit_ symbol."""

    def get_export_symbols(self, ext):
        return []  # a ctypes library, not a Python module

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler at all, etc.
            self._warn(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - CompileError, LinkError, no OpenMP
            self._warn(exc)

    @staticmethod
    def _warn(exc):
        msg = str(exc).strip().splitlines()
        print("WARNING: asyncopt native C/OpenMP kernel not built "
              f"({type(exc).__name__}: {msg[-1] if msg else ''}); "
              "the numba kernels will be used.", file=sys.stderr)


def _long_description():
    try:
        with open("README.md", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


setup(
    name="asyncopt",
    version="0.1.0",
    description=(
        "Asynchronous sparse optimization with dynamic gap-safe screening "
        "(DDSS): Lasso, sparse logistic regression, group Lasso"
    ),
    long_description=_long_description(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    packages=find_packages(exclude=["tests", "tests.*", "benchmarks", "benchmarks.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    package_data={"asyncopt.data": ["*.npz", "*.xz", "*.gz"]},
    include_package_data=False,
    ext_modules=EXT_MODULES,
    cmdclass={"build_ext": OptionalBuildExt},
    entry_points={
        "console_scripts": [
            "asyncopt-lasso=asyncopt.cli.lasso:main",
            "asyncopt-logreg=asyncopt.cli.logreg:main",
            "asyncopt-predict=asyncopt.cli.predict:main",
            "asyncopt-plot=asyncopt.cli.plot:main",
        ],
    },
    zip_safe=False,
)

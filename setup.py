"""Packaging for asyncopt.

Exact, tested pins live in requirements.txt; install_requires below only states
the runtime dependencies with loose lower bounds so that the package installs
into other environments too.
"""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "numpy>=1.24",
    "scipy>=1.10",
    "numba>=0.58",
    "scikit-learn>=1.3",
]

# ---------------------------------------------------------------------------
# C extension (native/): the C + OpenMP lock-free inner loop of Sha-DDSS.
# Not built yet; a later issue adds it here, e.g.
#
#     from setuptools import Extension
#     EXT_MODULES = [Extension("asyncopt._native", sources=["native/..."],
#                              extra_compile_args=["-O3", "-fopenmp"],
#                              extra_link_args=["-fopenmp"])]
#
# and must stay optional (the numba kernels are used when it is absent).
# ---------------------------------------------------------------------------
EXT_MODULES = []


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
    packages=find_packages(exclude=["tests", "tests.*", "benchmarks", "benchmarks.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    package_data={"asyncopt.data": ["*.npz", "*.xz", "*.gz"]},
    include_package_data=False,
    ext_modules=EXT_MODULES,
    entry_points={
        "console_scripts": [
            "asyncopt-lasso=asyncopt.cli.lasso:main",
            "asyncopt-logreg=asyncopt.cli.logreg:main",
        ],
    },
    zip_safe=False,
)

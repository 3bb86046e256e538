"""Data: LIBSVM reading, writing and byte-range sharding, synthetic CTR-like data, feature
crosses, and the embedded a9a set (docs/design.md §7)."""
from .crosses import feature_crosses
from .embedded import load_a9a
from .libsvm import LibsvmFormatError, libsvm_byte_ranges, load_libsvm, save_libsvm
from .synthetic import make_ctr

__all__ = [
    "LibsvmFormatError",
    "feature_crosses",
    "libsvm_byte_ranges",
    "load_a9a",
    "load_libsvm",
    "make_ctr",
    "save_libsvm",
]

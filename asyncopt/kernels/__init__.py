"""numba hot loops: sparse linear algebra and the stochastic inner loops."""

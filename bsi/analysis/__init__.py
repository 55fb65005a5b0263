"""Looking at models and results: Hessian spectra, decoding speed, side-by-side generations."""

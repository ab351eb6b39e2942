//! Bodies for the fuzz targets (fuzz/): outside bytes as a token and as a JWKS document.

"""The package version, in a module of its own so no layer needs the package face for it."""
__version__ = "0.1.0"

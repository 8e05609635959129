"""The one source of deferq's version: setuptools reads it at build time
(pyproject.toml, ``[tool.setuptools.dynamic]``) and ``deferq.__version__`` re-exports it."""

__version__ = "0.1.0"

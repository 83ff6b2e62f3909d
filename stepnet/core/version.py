"""stepnet's version (the package's and pyproject.toml's; a test keeps them equal)."""
VERSION = "0.1.0"

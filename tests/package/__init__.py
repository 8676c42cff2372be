"""The package's shape: its public surface, the exception tree, and the layering of its
folders and imports."""

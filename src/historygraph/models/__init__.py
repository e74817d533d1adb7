"""Local models that ship in PyPI packages and run offline on the CPU."""

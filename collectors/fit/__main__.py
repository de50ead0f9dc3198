"""``python -m collectors.fit ...`` runs ``snapviz fit``."""

from collectors.fit.cli import fit

if __name__ == "__main__":
    fit(prog_name="python -m collectors.fit")

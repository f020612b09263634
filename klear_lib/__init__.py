"""klear_lib: the library behind the Klear-Reasoner reproducibility notebooks (GPPO, ERC, data, evaluation)."""

__version__ = "0.1.0"

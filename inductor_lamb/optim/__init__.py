from .adagrad import Adagrad
from .lamb import Lamb
from .lars import Lars

__all__ = ["Adagrad", "Lamb", "Lars"]

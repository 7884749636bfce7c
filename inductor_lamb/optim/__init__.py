from .adagrad import Adagrad
from .lamb import Lamb
from .lamb16 import Lamb16
from .lars import Lars
from .novograd import NovoGrad

__all__ = ["Adagrad", "Lamb", "Lamb16", "Lars", "NovoGrad", "OPTIMIZERS"]

# Every optimizer of the package: what integrations build by name (TorchTitan's configs).
OPTIMIZERS = (Adagrad, Lamb, Lamb16, Lars, NovoGrad)

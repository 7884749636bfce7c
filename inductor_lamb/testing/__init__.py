"""Helpers of this package's tests and benchmark studies, not of training: the memory an
optimizer keeps per param (``memory``) and the accuracy of LAMB16's stored moments against a
float64 EMA of a gradient stream (``accuracy``). Installed with the package so that its tests and
studies measure the installed optimizers; nothing in ``inductor_lamb`` imports them."""

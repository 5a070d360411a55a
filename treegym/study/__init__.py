"""Equal-budget studies of training algorithms on the probe environments (``treegym study``)."""

"""toolledger's composition root: the only place that picks and wires backends."""

"""Reference queue scheduler: the embedded default and the executable specification of the protocol."""

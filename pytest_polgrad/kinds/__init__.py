"""The kinds of function the kit checks, one package or module per kind."""

"""Trace: the forward under torch.export with each captured launch as one op (``export``); the
declared dynamic shapes checked first (``shapes_check``); size expressions of constexprs and
guards (``size_functions``); a forward that branches on a size split into pieces
(``size_pieces``); ATen ops the back end cannot take decomposed (``decompose``)."""

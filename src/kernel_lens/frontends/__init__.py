"""Front-ends: launch capture, symbolic trace and AOT compilation, joined into GraphIR."""

"""IR -> typed launch plans and the printers that render them (int64 C++, TensorRT IExprBuilder)."""

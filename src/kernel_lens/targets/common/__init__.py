"""C++ pieces shared by every target (symbolic integer helpers, ...)."""

"""specscope: a visual debugger for self-speculative decoding. The engine and its server live in `backend`, the
kernels in `kernels`, the browser UI in `app`."""

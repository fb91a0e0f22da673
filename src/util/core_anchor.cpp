// Keeps warmctx_core a valid library while its module lists are being filled.

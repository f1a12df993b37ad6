"""Small helpers every layer uses: the console, user errors, secrets redaction, temporaries, build-once folders,
the tested versions, special tokens and pretrained-model files."""

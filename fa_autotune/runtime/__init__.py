"""What user code runs: the public API (``attention``, ``attention_fp8``, ``explain``), the
dispatcher's lookup chain, and the exported tuned-result files it reads."""

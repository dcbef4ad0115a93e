"""`kvwire validate`: recall of every KV format against bf16, on the serving stack.

config (what a sweep is) -> prompts (seeded tasks) -> backends (in-process engine, running
router, router on Ray) -> sweep (cells, resumable) -> results (JSON) -> recommend / plots /
report. Fidelity probes (KL, top-1, attention top-1) live in probe and need the in-process
engine. `python -m kvwire.validate --help` lists every flag.
"""

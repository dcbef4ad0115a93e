# The kvwire runtime image that k8s/ runs: kvwire/kvwire:<version in pyproject.toml>.
#   docker build -t kvwire/kvwire:0.1.0 .
# Everything Python is installed by scripts/setup.sh, the script the README and CI use, so the
# image has pyproject.toml's pins and CI exercises the same install steps (tests/k8s/ checks it).
# torch: the CUDA build (KVWIRE_TORCH=cuda; the build machine needs no GPU), which carries its
# own CUDA libraries; the GPU driver comes from the node through the NVIDIA container runtime.
FROM python:3.11-slim-bookworm

# gcc + libc headers: Triton compiles its kernel launchers at run time. wget: KubeRay's default
# probes, should a RayCluster leave its probes unset.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev wget \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/kvwire
COPY . .
ENV KVWIRE_TORCH=cuda
RUN scripts/setup.sh && rm -rf /root/.cache/pip
ENV PATH=/opt/kvwire/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1

LABEL org.opencontainers.image.title="kvwire" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.description="kvwire: disaggregated prefill/decode serving on FP8/NVFP4 KV pages"
CMD ["kvwire", "--help"]

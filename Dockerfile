# tensord images. Two targets, one runtime recipe:
#   docker build -t tensord .                          cpu (the default: the last stage): Debian 12 slim
#   docker build --target gpu -t tensord:gpu .         gpu: CUDA 13 on Ubuntu 24.04 (see the note at gpu-build)
# Packages come from deploy/packages/{build,runtime}.txt only, through deploy/docker/apt-install.sh; `make deps`
# reads the same files (tests/integration/test_packages.py checks both). `make test-container` builds the cpu
# target and runs it (tests/container/test_container.py). HEALTHCHECK is kept only in the docker image format
# (`podman build --format docker`).
#
# The runtime stages (cpu, gpu) are the same instructions on another base, so the two images behave alike:
# entry point, user, ports, health check. The test checks that they stay so.

# ---- gpu: build with CUDA=1 on NVIDIA's devel image ----
# Ubuntu 24.04 renames some of the Debian 12 packages the lists name (libgrpc29t64, libmicrohttpd12t64,
# libssl3t64, libopenmpi3t64) and ships oneDNN 3.x (libdnnl3), whose C API is not the 2.x one tensord uses:
# apt-install.sh stops and names what the archive lacks. Not built in CI (no registry there).
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS gpu-build
COPY deploy/packages/build.txt deploy/docker/apt-install.sh /tmp/packages/
RUN sh /tmp/packages/apt-install.sh /tmp/packages/build.txt
WORKDIR /src
COPY . .
RUN make ARCH=x86-64-v3 CUDA=1 -j"$(nproc)" build/tensord

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04 AS gpu
COPY deploy/packages/runtime.txt deploy/docker/apt-install.sh /tmp/packages/
RUN sh /tmp/packages/apt-install.sh /tmp/packages/runtime.txt && rm -rf /tmp/packages \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tensord \
    && mkdir -p /models
COPY --from=gpu-build /src/build/tensord /usr/local/bin/tensord
COPY deploy/docker/entrypoint.sh /usr/local/bin/tensord-entrypoint
ENV MODEL_BASE_PATH=/models MODEL_NAME=model
EXPOSE 8500 8501
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8501/v2/health/ready"]
# numeric, so that Kubernetes' runAsNonRoot can check it
USER 10001:10001
# sh runs the script whatever file mode the checkout gave it
ENTRYPOINT ["/usr/bin/tini", "--", "/bin/sh", "/usr/local/bin/tensord-entrypoint"]

# ---- cpu: build on Debian 12 for a portable ISA (x86-64-v3: AVX2, FMA), run on Debian 12 slim ----
FROM debian:12 AS build
COPY deploy/packages/build.txt deploy/docker/apt-install.sh /tmp/packages/
RUN sh /tmp/packages/apt-install.sh /tmp/packages/build.txt
WORKDIR /src
COPY . .
RUN make ARCH=x86-64-v3 -j"$(nproc)" build/tensord

FROM debian:12-slim AS cpu
COPY deploy/packages/runtime.txt deploy/docker/apt-install.sh /tmp/packages/
RUN sh /tmp/packages/apt-install.sh /tmp/packages/runtime.txt && rm -rf /tmp/packages \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tensord \
    && mkdir -p /models
COPY --from=build /src/build/tensord /usr/local/bin/tensord
COPY deploy/docker/entrypoint.sh /usr/local/bin/tensord-entrypoint
ENV MODEL_BASE_PATH=/models MODEL_NAME=model
EXPOSE 8500 8501
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8501/v2/health/ready"]
# numeric, so that Kubernetes' runAsNonRoot can check it
USER 10001:10001
# sh runs the script whatever file mode the checkout gave it
ENTRYPOINT ["/usr/bin/tini", "--", "/bin/sh", "/usr/local/bin/tensord-entrypoint"]

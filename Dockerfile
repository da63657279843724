# tensord image: build on Debian 12, run the CLI. (Not yet built or tested in CI: the deployment issue does that.)
FROM debian:12 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential libdnnl-dev libopenblas-dev libprotobuf-c-dev protobuf-c-compiler libonnx-dev zlib1g-dev \
      libmicrohttpd-dev libcjson-dev libgrpc-dev libsqlite3-dev libssl-dev xxd \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make ARCH=x86-64-v3 -j"$(nproc)" build/tensord

FROM debian:12-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libdnnl2 libopenblas0 libprotobuf-c1 zlib1g libgomp1 libmicrohttpd12 libcjson1 libgrpc29 libsqlite3-0 libssl3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/tensord /usr/local/bin/tensord
ENTRYPOINT ["/usr/local/bin/tensord"]

# The onceflow image: the binary (librdkafka is compiled from source) in a slim runtime, as a
# non-root user. `scripts/check-deploy` lints this file and holds the runtime's libraries to
# what the binary links.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The image's binary without symbols or line tables (180 MB stripped to 31 MB, 2026-12-07).
ENV CARGO_PROFILE_RELEASE_STRIP=symbols
# The dependencies in a layer of their own, built against empty sources: a change to
# onceflow's code rebuilds onceflow only. vendor/ holds librdkafka with its patches
# (vendor/README.md); zstd is built from source (the zstd-sys crate) and linked statically.
# The workspace's other members (the benchmark) only as manifests over empty sources.
COPY Cargo.toml Cargo.lock ./
COPY benches/bench/Cargo.toml ./benches/bench/
COPY benches/client-ceiling/Cargo.toml ./benches/client-ceiling/
COPY vendor ./vendor
RUN mkdir -p src benches/bench/src benches/client-ceiling/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in pipeline postgres_upsert http_calls outbox_relay avro_codec schema_codecs; do echo 'fn main() {}' > "benches/$b.rs"; done \
    && for m in bench/src client-ceiling/src; do echo 'fn main() {}' > "benches/$m/main.rs"; done \
    && touch benches/bench/src/lib.rs \
    && cargo build --release --locked --bin onceflow \
    && rm -rf src benches
COPY build.rs ./
COPY src ./src
COPY benches ./benches
# `onceflow --version` names the commit (build.rs): there is no .git in the image's context.
ARG ONCEFLOW_COMMIT=unknown
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin onceflow

FROM debian:bookworm-slim
# Exactly the libraries the binary links besides glibc and libgcc (in the base image):
# OpenSSL and zlib. Unpinned on purpose: the slim image takes Debian's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 onceflow \
    && useradd --system --uid 10001 --gid 10001 --no-create-home onceflow
COPY --from=build /src/target/release/onceflow /usr/local/bin/onceflow
COPY topologies /etc/onceflow/topologies
COPY config /etc/onceflow/config
USER 10001
ENV ONCEFLOW_METRICS_ADDR=0.0.0.0:9090
EXPOSE 9090
# SIGTERM commits the transaction in flight, then stops (a second one stops at once).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD ["onceflow", "probe", "--metrics-addr", "127.0.0.1:9090", "--path", "/healthz"]
# The instance id must be stable across restarts: set ONCEFLOW_INSTANCE_ID (the pod name).
ENTRYPOINT ["onceflow"]
CMD ["run", "/etc/onceflow/topologies/quickstart.yaml"]

# Builds the onceflow binary (librdkafka is compiled from source) into a slim runtime image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin onceflow

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
    && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 onceflow
COPY --from=build /src/target/release/onceflow /usr/local/bin/onceflow
COPY topologies /etc/onceflow/topologies
USER onceflow
# The instance id must be stable across restarts: set ONCEFLOW_INSTANCE_ID to the pod name.
ENTRYPOINT ["onceflow"]
CMD ["run", "/etc/onceflow/topologies/quickstart.yaml"]

# The resumeguard container image: the proxy binary and CA certificates on
# a Debian runtime, run as a non-root user; no compiler, no PostgreSQL (the
# managed server is a development convenience: in the image, `serve` needs
# an upstream, RESUMEGUARD_UPSTREAM).
#
#   podman build -t resumeguard .              # from source (the default target)
#   podman build --target prebuilt --build-arg BINARY=resumeguard \
#       -t resumeguard -f Dockerfile DIR       # DIR holds an already built binary
#
# Both base images can be replaced (a registry mirror, a local rootfs):
# --build-arg BUILD_BASE=... --build-arg RUNTIME_BASE=...
ARG BUILD_BASE=docker.io/library/rust:1-bookworm
ARG RUNTIME_BASE=docker.io/library/debian:bookworm-slim

FROM ${BUILD_BASE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin resumeguard \
    && install -D -m 0755 target/release/resumeguard /out/resumeguard

FROM ${RUNTIME_BASE} AS base
# CA certificates: the roots verify-full uses without sslrootcert (and with
# sslrootcert=system) are the system's bundle, read at start. A base that
# has it already (a local rootfs) is left as it is.
RUN if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && mkdir -p /var/lib/resumeguard /etc/resumeguard \
    && chown 10001:10001 /var/lib/resumeguard
# Configuration by environment (flags > RESUMEGUARD_* > RESUMEGUARD_CONFIG's
# file > defaults): listen on every interface of the container, admin API
# and probes on 6433, state in the volume, no managed PostgreSQL.
ENV RESUMEGUARD_LISTEN=0.0.0.0:6432 \
    RESUMEGUARD_ADMIN_LISTEN=0.0.0.0:6433 \
    RESUMEGUARD_STATE_DIR=/var/lib/resumeguard \
    RESUMEGUARD_MANAGED_ENABLED=false
WORKDIR /var/lib/resumeguard
VOLUME /var/lib/resumeguard
EXPOSE 6432 6433
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/resumeguard"]
CMD ["serve"]

# The runtime around a binary built outside (CI: target/release/resumeguard
# copied into a small context).
FROM base AS prebuilt
ARG BINARY=target/release/resumeguard
COPY --chmod=0755 ${BINARY} /usr/local/bin/resumeguard

# The default: the runtime around the binary built above.
FROM base AS runtime
COPY --from=build /out/resumeguard /usr/local/bin/resumeguard

# cdr-retrieval gateway image: build the wheel in one stage, install it into a venv in a slim
# runtime stage with the embedding model, run as an unprivileged user.
#   docker build -t cdr-retrieval .                       (EXTRAS: postgres by default)
#   docker build -t cdr-retrieval:ray --build-arg EXTRAS=postgres,ray .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python -m pip install --no-cache-dir build==1.*
COPY pyproject.toml README.md LICENSE CHANGELOG.md ./
COPY src ./src
RUN python -m build --wheel --outdir /dist .

FROM ${PYTHON_IMAGE} AS runtime
ARG EXTRAS=postgres
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/cdr/venv/bin:$PATH \
    CDR_CKF=/data/kb.ckf \
    CDR_CACHE_DIR=/var/cache/cdr
COPY --from=build /dist/*.whl /tmp/
RUN python -m venv /opt/cdr/venv \
    && /opt/cdr/venv/bin/pip install --no-cache-dir "$(ls /tmp/cdr_retrieval-*.whl)[${EXTRAS}]" \
    && rm /tmp/cdr_retrieval-*.whl \
    # the embedding model, hash-checked, at build time: the container starts without network
    && cdr models install embedder \
    && cdr --version \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin cdr \
    && mkdir -p /data /var/cache/cdr && chown cdr:cdr /data /var/cache/cdr
USER cdr
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8088
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8088/readyz', timeout=4).status == 200 else 1)"]
# Keys and the signing secret come from the environment (CDR_API_KEYS, CDR_SIGNING_SECRET);
# without them the gateway refuses to start and says which one is missing.
ENTRYPOINT ["cdr", "serve", "--host", "0.0.0.0", "--port", "8088", "--log-format", "json"]
CMD ["--workers", "2"]

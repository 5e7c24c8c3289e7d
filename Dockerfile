# recsys-evaluator: `evaluator run` with /metrics on :9108
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY evaluator ./evaluator
RUN pip install --no-cache-dir . \
    && groupadd --system --gid 10001 evaluator \
    && useradd --system --uid 10001 --gid 10001 --no-create-home evaluator
# numeric, so Kubernetes can verify runAsNonRoot without resolving a name
USER 10001:10001
# glibc: arrays of 128 KiB and more get mappings of their own, returned when freed
# (the open-request columns are rewritten as they merge; docs/operations.md, "Sizing
# memory"). Set before the interpreter starts, it does more than the evaluator's own
# mallopt call at start-up: ~300 against ~360 bytes of RSS per open request.
ENV MALLOC_MMAP_THRESHOLD_=131072
EXPOSE 9108
ENTRYPOINT ["evaluator"]
CMD ["run"]

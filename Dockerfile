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
EXPOSE 9108
ENTRYPOINT ["evaluator"]
CMD ["run"]

# recsys-evaluator: `evaluator run` with /metrics on :9108
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY evaluator ./evaluator
RUN pip install --no-cache-dir . && useradd --system --uid 10001 evaluator
USER evaluator
EXPOSE 9108
ENTRYPOINT ["evaluator"]
CMD ["run"]

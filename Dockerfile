# The worker (and starter) image for docker-compose.yml and for a real cluster.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY core ./core
COPY workflows ./workflows
COPY activities ./activities
COPY infra ./infra
COPY migrations ./migrations
COPY worker.py starter.py ./
RUN pip install --no-cache-dir .
RUN useradd --create-home agent && mkdir -p /data && chown agent /data
USER agent
ENV AGENT_DB_PATH=/data/agent.db
CMD ["python", "worker.py"]

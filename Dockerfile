# The worker (and starter) image for docker-compose.yml and for a real cluster.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
# Only the dependencies are installed: the application runs from /app, its folder.
RUN pip install --no-cache-dir .
COPY core ./core
COPY workflows ./workflows
COPY activities ./activities
COPY infra ./infra
COPY migrations ./migrations
COPY client ./client
COPY cli ./cli
COPY worker.py starter.py ./
RUN useradd --create-home agent && mkdir -p /data && chown agent /data
USER agent
ENV AGENT_DB_PATH=/data/agent.db
CMD ["python", "worker.py"]

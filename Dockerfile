# The product's image (worker, codec server, starter, migrations) for docker-compose.yml and a real
# cluster; the `dev` stage adds the local Stripe stand-in for `docker-compose --profile dev`.
FROM python:3.11-slim AS product
WORKDIR /app
COPY pyproject.toml README.md ./
# Only the dependencies are installed (pyproject's [project] dependencies): the application runs from
# /app, its folder.
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
ENV AGENT_DB_PATH=/data/agent.db PYTHONUNBUFFERED=1
CMD ["python", "worker.py"]

# Development only: localstripe behind the Stripe edge (devstack/localstripe_server.py), with the
# localstripe package of pyproject's `dev` extra.
FROM product AS dev
USER root
RUN pip install --no-cache-dir "localstripe>=1.15.10"
COPY devstack ./devstack
USER agent

"""The control plane's state: SQLAlchemy 2 models, Alembic migrations, engine and transactions."""

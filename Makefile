# toolledger: make demo (embedded, no services) and make test (everything, real services).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test test-unit test-kafka4 lint serve bench services-up services-down clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "toolledger needs Python >= 3.11"'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/toolledger demo

# The HTTP API on the embedded backend (data in .toolledger-dev/), with a fresh dev token.
DEV_DIR    := .toolledger-dev
SERVE_HOST ?= 127.0.0.1
SERVE_PORT ?= 8080
serve: $(STAMP)
	@mkdir -p $(DEV_DIR)/data
	@umask 077; token=$$($(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(32))'); \
	printf '{"tokens": [{"token": "%s", "tenant": "dev", "principal": "dev", "scopes": ["tools:call", "operator"]}]}\n' \
	  "$$token" > $(DEV_DIR)/tokens.json; \
	echo "dev token (tenant 'dev', new on every 'make serve'): $$token"; \
	echo "try:"; \
	echo "  curl -sS -X POST http://$(SERVE_HOST):$(SERVE_PORT)/v1/tools/create_ticket/calls \\"; \
	echo "    -H 'Authorization: Bearer $$token' -H 'Content-Type: application/json' \\"; \
	echo "    -H 'Idempotency-Key: demo-1' -d '{\"arguments\": {\"title\": \"Printer on fire\"}}'"; \
	echo "(run it twice: the second answer is a replay, 'Idempotent-Replayed: true' with curl -i)"
	exec $(BIN)/toolledger serve --create --host $(SERVE_HOST) --port $(SERVE_PORT) \
	  --data $(DEV_DIR)/data --tokens $(DEV_DIR)/tokens.json

# The whole suite: starts a real Kafka broker and a real PostgreSQL, runs every test
# (both backends of the contract suite), stops the services even when tests fail.
test: $(STAMP)
	bash services/with-services.sh $(BIN)/pytest -p no:cacheprovider -q

# Unit and embedded tests only: no services needed.
test-unit: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider -q -m "not services"

# The contract suite once more against a Kafka 4.x broker.
test-kafka4: $(STAMP)
	KAFKA_MAJOR=4 TOOLLEDGER_KAFKA_PORT=29092 TOOLLEDGER_KAFKA_CONTROLLER_PORT=29093 \
	  bash services/with-services.sh $(BIN)/pytest -p no:cacheprovider -q tests/contract

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict

bench: $(STAMP)
	$(BIN)/python -m bench.embedded

services-up:
	bash services/up.sh

services-down:
	bash services/down.sh

clean:
	rm -rf $(VENV) .services build *.egg-info

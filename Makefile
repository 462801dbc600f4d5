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

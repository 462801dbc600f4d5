# toolledger: make demo (embedded, no services) and make test (everything, real services).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test test-unit test-kafka4 lint docs serve bench services-up services-down clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "toolledger needs Python >= 3.11"'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all,dev]'
	@rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/toolledger demo

# The HTTP API on the embedded backend (data in .toolledger-dev/, a new ledger only in a new
# directory), with fresh dev tokens: alice's agent's (tools:call), alice's own
# (approvals:confirm: what her agent asked, she confirms) and an operator's (four eyes).
DEV_DIR    := .toolledger-dev
SERVE_HOST ?= 127.0.0.1
SERVE_PORT ?= 8080
serve: $(STAMP)
	@mkdir -p $(DEV_DIR)/data
	@umask 077; agent=$$($(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(32))'); \
	user=$$($(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(32))'); \
	operator=$$($(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(32))'); \
	printf '{"tokens": [{"token": "%s", "tenant": "dev", "principal": "alice", "scopes": ["tools:call"]}, {"token": "%s", "tenant": "dev", "principal": "alice", "scopes": ["approvals:confirm"]}, {"token": "%s", "tenant": "dev", "principal": "operator", "scopes": ["operator"]}]}\n' \
	  "$$agent" "$$user" "$$operator" > $(DEV_DIR)/tokens.json; \
	url=http://$(SERVE_HOST):$(SERVE_PORT); \
	echo "dev tokens (tenant 'dev', new on every 'make serve'; the file is re-read while serving):"; \
	echo "  AGENT=$$agent"; \
	echo "  USER=$$user"; \
	echo "  OPERATOR=$$operator"; \
	echo "(AGENT: alice's agent calls tools; USER: alice herself confirms what her agent asked;"; \
	echo " OPERATOR: approves what needs four eyes)"; \
	echo "a call (run it twice: the second answer is a replay, 'Idempotent-Replayed: true' with curl -i):"; \
	echo "  curl -sS -X POST $$url/v1/tools/create_ticket/calls -H \"Authorization: Bearer \$$AGENT\" \\"; \
	echo "    -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-1' -d '{\"arguments\": {\"title\": \"Printer on fire\"}}'"; \
	echo "an approval: a charge above 10.00 answers 428 with approval_request.id; the operator approves it"; \
	echo "(four eyes); the agent calls again with the same key and arguments and it runs, once (the grant"; \
	echo "is kept with the key: no token to carry; add -H 'Prefer: wait=60' to the retry to wait for the human):"; \
	echo "  curl -sS -X POST $$url/v1/tools/charge_card/calls -H \"Authorization: Bearer \$$AGENT\" \\"; \
	echo "    -H 'Content-Type: application/json' -H 'Idempotency-Key: charge-1' \\"; \
	echo "    -d '{\"arguments\": {\"customer_id\": \"cus_1\", \"amount_cents\": 1200, \"currency\": \"USD\"}}'"; \
	echo "  curl -sS -X POST $$url/v1/approval-requests/<id>/approve -H \"Authorization: Bearer \$$OPERATOR\""; \
	echo "  (then the same charge curl again)"; \
	echo "a charge up to 10.00 (or an email) is the user's to confirm, with her own token: \$$USER"; \
	echo "(\$$AGENT, the token that made the call, is refused: 403); then the agent calls again:"; \
	echo "  curl -sS -X POST $$url/v1/tools/charge_card/calls -H \"Authorization: Bearer \$$AGENT\" \\"; \
	echo "    -H 'Content-Type: application/json' -H 'Idempotency-Key: charge-2' \\"; \
	echo "    -d '{\"arguments\": {\"customer_id\": \"cus_1\", \"amount_cents\": 800, \"currency\": \"USD\"}}'"; \
	echo "  curl -sS -X POST $$url/v1/approval-requests/<id>/approve -H \"Authorization: Bearer \$$USER\""; \
	echo "  (then the same small charge curl again)"; \
	echo "the console: $$url/console (sign in with \$$OPERATOR, or with \$$USER to confirm alice's requests)"; \
	echo "the same as an operator with the CLI (--url defaults to http://127.0.0.1:8080, or TOOLLEDGER_URL):"; \
	echo "  export TOOLLEDGER_URL=$$url TOOLLEDGER_TOKEN=\$$OPERATOR"; \
	echo "  $(BIN)/toolledger approvals list --status pending"; \
	echo "  $(BIN)/toolledger approvals approve <id>      (or: approvals deny <id> --reason '...')"; \
	echo "  $(BIN)/toolledger switch off charge_card --reason 'incident 1'   (and: switch on ...)"; \
	echo "  $(BIN)/toolledger calls search --key charge-1"
	exec $(BIN)/toolledger serve --host $(SERVE_HOST) --port $(SERVE_PORT) \
	  --data $(DEV_DIR)/data --tokens $(DEV_DIR)/tokens.json --demo

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
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict
	$(BIN)/lint-imports --no-cache

# The documentation site, offline, into site/ (tests/unit/test_docs_snippets.py builds it too).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python -m bench.embedded

services-up:
	bash services/up.sh

services-down:
	bash services/down.sh

clean:
	rm -rf $(VENV) .services build site *.egg-info

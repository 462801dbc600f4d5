"""While a Kafka-mode process starts, aiokafka's error for a group coordinator that is not
available yet is logged at INFO (and only where INFO is shown); other errors stay errors,
and once the process is past starting the filter is gone."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from aiokafka.errors import GroupCoordinatorNotAvailableError, KafkaConnectionError

from toolledger.distributed import COORDINATOR_LOG, starting


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Kept]:
    handler = Kept()
    logger = logging.getLogger(COORDINATOR_LOG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def _lookup_failed(err: Exception) -> None:
    """What aiokafka's ensure_coordinator_known logs."""
    logging.getLogger(COORDINATOR_LOG).error("Group Coordinator Request failed: %s", err)


def test_a_coordinator_not_available_yet_is_info_while_starting(kept: Kept) -> None:
    logging.getLogger(COORDINATOR_LOG).setLevel(logging.INFO)
    with starting():
        _lookup_failed(GroupCoordinatorNotAvailableError())
        _lookup_failed(KafkaConnectionError())
    _lookup_failed(GroupCoordinatorNotAvailableError())  # started: an error again
    assert [(r.levelname, r.getMessage()) for r in kept.records] == [
        ("INFO", f"Group Coordinator Request failed: {GroupCoordinatorNotAvailableError()}"),
        ("ERROR", f"Group Coordinator Request failed: {KafkaConnectionError()}"),
        ("ERROR", f"Group Coordinator Request failed: {GroupCoordinatorNotAvailableError()}"),
    ]


def test_it_is_not_shown_where_info_is_not(kept: Kept) -> None:
    logging.getLogger(COORDINATOR_LOG).setLevel(logging.WARNING)
    with starting():
        _lookup_failed(GroupCoordinatorNotAvailableError())
    assert kept.records == []

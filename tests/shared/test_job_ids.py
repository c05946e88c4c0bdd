import time
import uuid

from shared.job_ids import created_at, new_job_id


def test_a_new_id_is_a_uuid7_that_says_when_it_was_made():
    before = time.time()
    job_id = new_job_id()
    parsed = uuid.UUID(job_id)
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert len(job_id) == 32 and job_id == parsed.hex
    assert before - 0.001 <= created_at(job_id) <= time.time()
    assert created_at(new_job_id(1796205011.25)) == 1796205011.25


def test_ids_sort_by_time_and_do_not_repeat():
    ids = [new_job_id(1796205011 + i) for i in range(100)]
    assert ids == sorted(ids)
    assert len({new_job_id(1796205011) for _ in range(1000)}) == 1000


def test_an_id_of_another_shape_is_undated():
    for job_id in (uuid.uuid4().hex, "job1", "", new_job_id().upper(), new_job_id()[:-1]):
        assert created_at(job_id) is None

"""A batch's finished lines put together from its parts: in input order whatever order they
finished in, split into the output file and the error file, a line written twice kept once."""

from services.api.batches import parts
from shared.blobstore.local import LocalBlobStore


async def test_parts_are_assembled_in_input_order(tmp_path):
    blobs = LocalBlobStore(tmp_path)
    written = [{3: b'o{"n":3}', 0: b'e{"n":0}'}, {1: b'o{"n":1}', 4: b'o{"n":4}'},
               {2: b'e{"n":2}', 1: b'o{"n":"again"}'}]
    keys = []
    for lines in written:
        keys.append(parts.part_key("batch_x", "k1", 1796205011))
        await blobs.put(keys[-1], parts.encode(lines))
    assert len(set(keys)) == 3 and all(k.startswith("files/2026120209/k1/batch_x.part-")
                                       for k in keys)
    made = await parts.assemble(blobs, keys)
    try:
        made.output.seek(0)
        made.errors.seek(0)
        assert made.output.read() == b'{"n":1}\n{"n":3}\n{"n":4}\n'
        assert made.errors.read() == b'{"n":0}\n{"n":2}\n'
        assert (made.outputs, made.failures) == (3, 2)
    finally:
        made.close()
    empty = await parts.assemble(blobs, [])
    assert (empty.outputs, empty.failures) == (0, 0)
    empty.close()

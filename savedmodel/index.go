package savedmodel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/syndtr/goleveldb/leveldb/opt"
	"github.com/syndtr/goleveldb/leveldb/storage"
	"github.com/syndtr/goleveldb/leveldb/table"
)

// variables.index is a LevelDB-format table (formats.md §6.3), read with
// goleveldb's table reader, which needs no database around it and verifies
// every block's masked crc32c. That reader trusts the block handles it finds
// (it allocates a handle's size before reading it), so checkTable first
// proves that every handle in the footer and the index block lies inside
// the file: a corrupt or hostile index then cannot make it allocate more
// than the file holds.

const (
	footerLen   = 48 // two padded block handles and the magic
	trailerLen  = 5  // block type byte and masked crc32c
	tableMagic  = 0xdb4775248b80fb57
	maxIndexLen = 1 << 30 // variables.index of a 100M-variable model is far smaller
)

// kv is one table entry.
type kv struct{ key, value []byte }

// readTable returns the entries of a table in stored order.
func readTable(data []byte) (kvs []kv, err error) {
	if err := checkTable(data); err != nil {
		return nil, err
	}
	// goleveldb is not written for hostile input; a panic it raises on a
	// block that passed its checksum is reported as a corrupt table.
	defer func() {
		if r := recover(); r != nil {
			kvs, err = nil, fmt.Errorf("corrupt table: %v", r)
		}
	}()
	o := &opt.Options{Strict: opt.StrictBlockChecksum | opt.StrictReader}
	r, err := table.NewReader(bytes.NewReader(data), int64(len(data)), storage.FileDesc{Type: storage.TypeTable}, nil, nil, o)
	if err != nil {
		return nil, err
	}
	defer r.Release()
	it := r.NewIterator(nil, nil)
	defer it.Release()
	for it.Next() {
		kvs = append(kvs, kv{bytes.Clone(it.Key()), bytes.Clone(it.Value())})
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	return kvs, nil
}

// handle is a LevelDB BlockHandle.
type handle struct{ offset, size uint64 }

func readHandle(b []byte) (handle, int, error) {
	off, n := binary.Uvarint(b)
	if n <= 0 {
		return handle{}, 0, errors.New("bad block handle")
	}
	size, m := binary.Uvarint(b[n:])
	if m <= 0 {
		return handle{}, 0, errors.New("bad block handle")
	}
	return handle{off, size}, n + m, nil
}

// within reports whether the block and its trailer end before limit.
func (h handle) within(limit uint64) bool {
	return h.size <= limit && h.offset <= limit-h.size && limit-h.size-h.offset >= trailerLen
}

// checkTable checks the footer and that every block handle stays inside
// the file.
func checkTable(data []byte) error {
	if len(data) < footerLen {
		return fmt.Errorf("table is %d bytes, shorter than its %d-byte footer", len(data), footerLen)
	}
	if len(data) > maxIndexLen {
		return fmt.Errorf("table is %d bytes, more than an index can be (%d)", len(data), maxIndexLen)
	}
	footer := data[len(data)-footerLen:]
	if binary.LittleEndian.Uint64(footer[footerLen-8:]) != tableMagic {
		return errors.New("not a table: bad magic number in the footer")
	}
	limit := uint64(len(data) - footerLen)
	meta, n, err := readHandle(footer)
	if err != nil {
		return fmt.Errorf("footer: %w", err)
	}
	index, _, err := readHandle(footer[n:])
	if err != nil {
		return fmt.Errorf("footer: %w", err)
	}
	if !meta.within(limit) || !index.within(limit) {
		return errors.New("footer: block handle outside the file")
	}
	return checkIndexBlock(data[index.offset:index.offset+index.size], limit)
}

// checkIndexBlock walks a block's entries (formats.md §6.3) and checks
// that each value, a data block handle, stays before limit.
func checkIndexBlock(block []byte, limit uint64) error {
	if len(block) < 4 {
		return errors.New("index block too short")
	}
	restarts := uint64(binary.LittleEndian.Uint32(block[len(block)-4:]))
	if restarts > uint64(len(block)-4)/4 {
		return errors.New("index block: bad restart count")
	}
	body := block[:uint64(len(block)-4)-4*restarts]
	for len(body) > 0 {
		var f [3]uint64
		for i := range f {
			v, n := binary.Uvarint(body)
			if n <= 0 {
				return errors.New("index block: bad entry header")
			}
			f[i], body = v, body[n:]
		}
		nonShared, valueLen := f[1], f[2]
		if nonShared > uint64(len(body)) || valueLen > uint64(len(body))-nonShared {
			return errors.New("index block: entry runs past the block")
		}
		h, _, err := readHandle(body[nonShared : nonShared+valueLen])
		if err != nil || !h.within(limit) {
			return errors.New("index block: data block handle outside the file")
		}
		body = body[nonShared+valueLen:]
	}
	return nil
}

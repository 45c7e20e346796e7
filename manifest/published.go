package manifest

import (
	"errors"
	"fmt"
	"time"
)

// Publication records one destination `kiln pack` wrote a repository to:
// where ("image:REG/REPO:TAG", "dir:PATH", ...), the digest that names
// what arrived there (the image manifest's digest; for a directory, that
// of its kiln.json), and when.
type Publication struct {
	Destination string    `json:"destination"`
	Digest      Digest    `json:"digest"`
	Time        time.Time `json:"time"`
}

// Validate checks the record's fields.
func (p Publication) Validate() error {
	if p.Destination == "" {
		return errors.New("publication: destination is empty")
	}
	if err := p.Digest.Validate(); err != nil {
		return fmt.Errorf("publication to %s: %w", p.Destination, err)
	}
	return nil
}

// AddPublication returns list with p as the latest record of its
// destination: an earlier record of the same destination is replaced, so
// the list holds one record per destination, in the order last written.
func AddPublication(list []Publication, p Publication) []Publication {
	out := make([]Publication, 0, len(list)+1)
	for _, q := range list {
		if q.Destination != p.Destination {
			out = append(out, q)
		}
	}
	return append(out, p)
}

package manifest

import (
	"testing"
	"time"
)

func TestAddPublication(t *testing.T) {
	d := DigestBytes([]byte("x"))
	var list []Publication
	list = AddPublication(list, Publication{Destination: "image:r/a:1", Digest: d, Time: time.Unix(1, 0)})
	list = AddPublication(list, Publication{Destination: "dir:out", Digest: d, Time: time.Unix(2, 0)})
	list = AddPublication(list, Publication{Destination: "image:r/a:1", Digest: d, Time: time.Unix(3, 0)})
	if len(list) != 2 || list[0].Destination != "dir:out" || list[1].Time.Unix() != 3 {
		t.Fatalf("AddPublication = %+v, want dir:out then the latest image:r/a:1", list)
	}
	if err := (Publication{Destination: "dir:x", Digest: "sha256:nope"}).Validate(); err == nil {
		t.Error("Validate accepted a bad digest")
	}
}

package api

import (
	"testing"

	"github.com/sluicehq/sluice/gate/job"
)

// FuzzDecodeBatch: the batch decoder never panics; a refused envelope is invalid_request naming
// a field, an accepted one yields 1 to 1,000 items, each decoded or refused on its own.
func FuzzDecodeBatch(f *testing.F) {
	f.Add([]byte(`{"jobs":[{"tenant":"a"},{"tenant":1},{"tenant":"b","payload":[1]}]}`))
	f.Add([]byte(`{"jobs":[]}`))
	f.Add([]byte(`{"jobs":null}`))
	f.Add([]byte(`{"jobs":{"tenant":"a"}}`))
	f.Add([]byte("{\"jobs\":[{\"tenant\":\"\xff\"}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, errs, err := decodeBatch(data)
		if err != nil {
			je, ok := err.(*job.Error)
			if !ok || je.Code != job.CodeInvalidRequest || je.Detail["field"] == "" {
				t.Fatalf("envelope refusal %v", err)
			}
			return
		}
		if len(reqs) == 0 || len(reqs) > 1000 || len(errs) != len(reqs) {
			t.Fatalf("%d items, %d errors", len(reqs), len(errs))
		}
		for _, e := range errs {
			if e != nil && job.ErrorCode(e) != job.CodeInvalidRequest {
				t.Fatalf("item refusal %v", e)
			}
		}
	})
}

// FuzzCursor: any cursor string either decodes to a positive id that encodes back to itself or
// is refused with invalid_request naming cursor.
func FuzzCursor(f *testing.F) {
	f.Add(encodeCursor(42))
	f.Add("garbage")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := decodeCursor(s)
		if err != nil {
			if je, ok := err.(*job.Error); !ok || je.Detail["field"] != "cursor" {
				t.Fatalf("refusal %v", err)
			}
			return
		}
		if id <= 0 {
			t.Fatalf("cursor %q decoded to %d", s, id)
		}
		if _, err := decodeCursor(encodeCursor(id)); err != nil {
			t.Fatalf("round trip of %d: %v", id, err)
		}
	})
}

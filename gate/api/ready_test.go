package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReadyzHidesErrorText: /readyz needs no token, so an unready answer names a fixed reason
// word and never the error behind it (addresses, database user names); the error is logged.
func TestReadyzHidesErrorText(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	secret := "Error 1045 (28000): Access denied for user 'sluice_prod'@'10.1.2.3' (using password: YES)"
	for _, c := range []struct {
		err    error
		reason string
	}{
		{NotReady(ReadyReasonDatabase, fmt.Errorf("database: %w", errors.New(secret))), "database"},
		{NotReady(ReadyReasonMigrations, errors.New("schema at 41, want 42 on "+secret)), "migrations"},
		{NotReady(ReadyReasonStopping, errors.New("shutting down "+secret)), "stopping"},
		{fmt.Errorf("wrapped: %w", NotReady(ReadyReasonDatabase, errors.New(secret))), "database"},
		{errors.New(secret), "unknown"},
		{NotReady("made-up "+secret, errors.New(secret)), "unknown"},
	} {
		s := testServer(t)
		var logged bytes.Buffer
		s.cfg.Log = slog.New(slog.NewTextHandler(&logged, nil))
		s.cfg.Ready = func(context.Context) error { return c.err }
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
		if w.Code != 503 {
			t.Errorf("%v: HTTP %d, want 503", c.err, w.Code)
		}
		if raw := w.Body.String(); strings.Contains(raw, "10.1.2.3") || strings.Contains(raw, "sluice_prod") || strings.Contains(raw, "Access denied") {
			t.Errorf("%v: /readyz shows the error text to anyone: %s", c.err, raw)
		}
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %q: %v", w.Body, err)
		}
		if body["ready"] != false || body["reason"] != c.reason || body["status"] != "unavailable" || body["error_code"] != "unavailable" {
			t.Errorf("%v: body %v, want ready false, reason %q, status and error_code unavailable", c.err, body, c.reason)
		}
		if !strings.Contains(logged.String(), "10.1.2.3") {
			t.Errorf("%v: the error is not in the log: %q", c.err, logged.String())
		}
		if err := spec.CheckAnswer("GET", "/readyz", w.Code, w.Body.Bytes()); err != nil {
			t.Errorf("%v: %v", c.err, err)
		}
	}
}

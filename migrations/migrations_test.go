package migrations

import (
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func TestStatements(t *testing.T) {
	got := Statements("-- a comment\nCREATE TABLE a (\n  x INT -- inline stays\n);\n\nINSERT INTO a VALUES (1);\n-- end\n")
	if len(got) != 2 || got[1] != "INSERT INTO a VALUES (1)" {
		t.Fatalf("statements %q", got)
	}
}

// TestEmbedded checks the embedded files: versions unique and ordered, none empty.
func TestEmbedded(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 || all[0].Version != 1 {
		t.Fatalf("migrations %v: want the first to be version 1", all)
	}
	for i, m := range all {
		if i > 0 && m.Version <= all[i-1].Version {
			t.Errorf("%s is not after %s", m.Name, all[i-1].Name)
		}
		if len(Statements(m.SQL)) == 0 {
			t.Errorf("%s has no statements", m.Name)
		}
	}
	if Latest() != all[len(all)-1].Version {
		t.Errorf("Latest() = %d, want %d", Latest(), all[len(all)-1].Version)
	}
}

// TestDSN: a migration's connection waits StatementTimeout for a statement, unless the DSN names
// its own read timeout.
func TestDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn  string
		want time.Duration
	}{
		{"root@tcp(127.0.0.1:3306)/sluice", StatementTimeout},
		{"root@tcp(127.0.0.1:3306)/sluice?readTimeout=90s&parseTime=true", 90 * time.Second},
	} {
		got, err := DSN(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := mysql.ParseDSN(got)
		if err != nil || cfg.ReadTimeout != tc.want || cfg.DBName != "sluice" {
			t.Errorf("DSN(%q) = %q (%v): read timeout %v, want %v", tc.dsn, got, err, cfg.ReadTimeout, tc.want)
		}
	}
	if _, err := DSN("not a dsn"); err == nil {
		t.Error("a DSN the driver cannot parse: no error")
	}
}

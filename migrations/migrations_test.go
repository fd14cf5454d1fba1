package migrations

import "testing"

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

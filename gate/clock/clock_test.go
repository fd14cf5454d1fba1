package clock

import (
	"context"
	"testing"
	"time"
)

func TestFake(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	f := NewFake(start)
	now, _ := f.Now(context.Background())
	if now.Location() != time.UTC || now.Nanosecond()%1000 != 0 || !now.Equal(start.Truncate(time.Microsecond)) {
		t.Errorf("NewFake: %v, want %v in UTC truncated to µs", now, start)
	}
	f.Advance(1500 * time.Nanosecond)
	later, _ := f.Now(context.Background())
	if d := later.Sub(now); d != time.Microsecond {
		t.Errorf("Advance(1.5µs) moved %v, want 1µs (truncated)", d)
	}
}

// stepClock is a source whose readings a test sets, and a local clock it moves by hand.
type stepClock struct {
	src   time.Time
	reads int
	local time.Time
	rtt   time.Duration // added to local by each reading
}

func (c *stepClock) Now(context.Context) (time.Time, error) {
	c.reads++
	c.local = c.local.Add(c.rtt)
	return c.src, nil
}

func TestSynced(t *testing.T) {
	ctx := context.Background()
	db := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	c := &stepClock{src: db, local: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), rtt: time.Millisecond}
	s := NewSynced(c, 10*time.Second)
	s.local = func() time.Time { return c.local }

	now, _ := s.Now(ctx)
	if !now.Equal(db) || c.reads != 1 {
		t.Fatalf("first reading %v after %d reads, want the source's %v after 1", now, c.reads, db)
	}
	// Carried forward from when the reading was requested: 1 ms (the round trip) + 2 s.
	c.local = c.local.Add(2 * time.Second)
	if now, _ = s.Now(ctx); !now.Equal(db.Add(2*time.Second+time.Millisecond)) || c.reads != 1 {
		t.Errorf("2 s later: %v after %d reads, want %v from the kept reading", now, c.reads, db.Add(2001*time.Millisecond))
	}
	// Past Every the source is read again; a source that stepped back does not take readings
	// back.
	c.local = c.local.Add(10 * time.Second)
	c.src = db.Add(time.Second)
	if now2, _ := s.Now(ctx); c.reads != 2 || !now2.Equal(now) {
		t.Errorf("after a step back: %v after %d reads, want %v (never backwards) after 2", now2, c.reads, now)
	}
	c.src = db.Add(time.Hour)
	c.local = c.local.Add(11 * time.Second)
	if now, _ = s.Now(ctx); !now.Equal(db.Add(time.Hour)) || c.reads != 3 {
		t.Errorf("after a step forward: %v after %d reads, want %v after 3", now, c.reads, db.Add(time.Hour))
	}
	// A slow reading is used once and not kept.
	c.rtt = 50 * time.Millisecond
	c.local = c.local.Add(11 * time.Second)
	c.src = db.Add(2 * time.Hour)
	s.Now(ctx)
	s.Now(ctx)
	if c.reads != 5 {
		t.Errorf("%d reads after two calls with slow readings, want 5 (each read again)", c.reads)
	}
}

package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/gate/config"
)

// ErrNoArrivals is Run's error for a source with nothing in it.
var ErrNoArrivals = errors.New("no arrivals to simulate")

// Comparison is one replay of the same arrivals under the configuration in force (Current) and
// under it with Changes applied (Changed).
type Comparison struct {
	Changes map[string]json.RawMessage `json:"changes"`
	Current *Result                    `json:"current"`
	Changed *Result                    `json:"changed"`
}

// Run replays src once, under current and under current with changes (config.Apply: an unknown
// key or a bad value is an error naming it), side by side. progress, if set, is called with the
// arrivals replayed so far every 100,000 arrivals. It stops with ctx's error when ctx ends.
func Run(ctx context.Context, src Source, current config.Config, changes map[string]json.RawMessage, opts Options, progress func(n int)) (*Comparison, error) {
	changed := current
	if len(changes) > 0 {
		var err error
		if changed, err = config.Apply(current, changes); err != nil {
			return nil, fmt.Errorf("changes: %w", err)
		}
	}
	a, b := New(current, opts), New(changed, opts)
	n := 0
	for {
		arr, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		a.Arrive(arr)
		b.Arrive(arr)
		n++
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("stopped after %d arrivals: %w", n, err)
			}
		}
		if progress != nil && n%100_000 == 0 {
			progress(n)
		}
	}
	if n == 0 {
		return nil, ErrNoArrivals
	}
	if changes == nil {
		changes = map[string]json.RawMessage{}
	}
	return &Comparison{Changes: changes, Current: a.Finish(), Changed: b.Finish()}, nil
}

// Shift is how a tenant's wait moved from Current to Changed.
type Shift struct {
	Tenant string  `json:"tenant"`
	P95MS  float64 `json:"p95_delta_ms"` // Changed's p95 wait less Current's
	// Refused is Changed's refusals less Current's.
	Refused int `json:"refused_delta"`
}

// Shifts returns the tenants whose p95 wait or refusals changed, the most helped first (a
// gain: the wait shortened) and the most hurt last.
func (c *Comparison) Shifts() []Shift {
	out := []Shift{}
	for t, cur := range c.Current.Tenants {
		ch := c.Changed.Tenants[t]
		s := Shift{Tenant: t, P95MS: ch.Wait.P95 - cur.Wait.P95, Refused: refusedOf(ch) - refusedOf(cur)}
		if s.P95MS != 0 || s.Refused != 0 {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].P95MS != out[j].P95MS {
			return out[i].P95MS < out[j].P95MS
		}
		if out[i].Refused != out[j].Refused {
			return out[i].Refused < out[j].Refused
		}
		return out[i].Tenant < out[j].Tenant
	})
	return out
}

func refusedOf(tr *TenantResult) int {
	n := 0
	for _, k := range tr.Refused {
		n += k
	}
	for _, k := range tr.SlotsRefused {
		n += k
	}
	return n
}

// WriteJSON writes c as one JSON object with the shifts, bounded by top (≤ 0: everything): each
// result's tenants are the top busiest (Tops) and the totals, the shifts the top most helped and
// the top most hurt, so that the answer's size does not grow with the tenants replayed;
// tenants_total says how many there were.
func (c *Comparison) WriteJSON(w io.Writer, top int) error {
	shifts := c.Shifts()
	cur, ch := c.Current, c.Changed
	if top > 0 {
		if len(shifts) > 2*top {
			shifts = append(shifts[:top:top], shifts[len(shifts)-top:]...)
		}
		tops := cur.Tops(top)
		cur, ch = cur.only(tops), ch.only(tops)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Changes      map[string]json.RawMessage `json:"changes"`
		Current      *Result                    `json:"current"`
		Changed      *Result                    `json:"changed"`
		Shifts       []Shift                    `json:"shifts"`
		TenantsTotal int                        `json:"tenants_total"`
	}{c.Changes, cur, ch, shifts, len(c.Current.Tenants)})
}

// WriteTable writes c for a reader: the top tenants (by arrivals) and all together, current
// beside changed, then refusals by code and scope, utilisation, depth over time and the tenants
// that gain or lose.
func (c *Comparison) WriteTable(w io.Writer, top int) error {
	cur, ch := c.Current, c.Changed
	fmt.Fprintf(w, "replayed %d job arrivals and %d slot requests of %d tenants from %s, over %s (to the last outcome)\n",
		cur.Total.Arrivals, cur.Total.Slots, len(cur.Tenants), cur.Start.Format(time.RFC3339Nano), cur.End.Sub(cur.Start).Round(time.Millisecond))
	fmt.Fprintf(w, "changes: %s\n\n", changeText(c.Changes))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tenant\tarrivals\twait p50 ms\tp95\tp99\tmax\trefused\t\t→ p50 ms\tp95\tp99\tmax\trefused\t")
	row := func(name string, a, b *TenantResult) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t\t%s\t%s\t%s\t%s\t%d\t\n", name, a.Arrivals+a.Slots,
			ms(a.Wait.P50), ms(a.Wait.P95), ms(a.Wait.P99), ms(a.Wait.Max), refusedOf(a),
			ms(b.Wait.P50), ms(b.Wait.P95), ms(b.Wait.P99), ms(b.Wait.Max), refusedOf(b))
	}
	for _, t := range cur.Tops(top) {
		row(t, cur.Tenants[t], ch.Tenants[t])
	}
	if n := len(cur.Tenants); top > 0 && n > top {
		fmt.Fprintf(tw, "(%d more)\t\t\t\t\t\t\t\t\t\t\t\t\t\n", n-top)
	}
	row("all", &cur.Total, &ch.Total)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	codes := map[string]bool{}
	for _, r := range []*Result{cur, ch} {
		for k := range r.Total.Refused {
			codes[k] = true
		}
		for k := range r.Total.SlotsRefused {
			codes["slot "+k] = true
		}
	}
	if len(codes) == 0 {
		fmt.Fprintln(w, "refusals: none in either")
	} else {
		fmt.Fprintln(w, "refusals by code and scope (current → changed):")
		keys := make([]string, 0, len(codes))
		for k := range codes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			a, b := cur.Total.Refused[k], ch.Total.Refused[k]
			if slot, ok := strings.CutPrefix(k, "slot "); ok {
				a, b = cur.Total.SlotsRefused[slot], ch.Total.SlotsRefused[slot]
			}
			fmt.Fprintf(w, "  %-32s %d → %d\n", k, a, b)
		}
	}
	fmt.Fprintf(w, "executor utilisation: %.1f %% → %.1f %%\n", 100*cur.Utilisation, 100*ch.Utilisation)
	fmt.Fprintf(w, "never started: %d → %d\n", cur.Total.NeverStarted, ch.Total.NeverStarted)
	fmt.Fprintf(w, "depth, most queued per %s: max %d → %d\n  current %s\n  changed %s\n", cur.DepthEvery, cur.DepthMax, ch.DepthMax,
		spark(cur.Depth, max(cur.DepthMax, ch.DepthMax)), spark(ch.Depth, max(cur.DepthMax, ch.DepthMax)))
	shifts := c.Shifts()
	if len(shifts) == 0 {
		fmt.Fprintln(w, "no tenant's p95 wait or refusals change")
		return nil
	}
	var gain, lose []string
	for _, s := range shifts {
		text := fmt.Sprintf("%s (p95 %+.1f ms, refused %+d)", s.Tenant, s.P95MS, s.Refused)
		if s.P95MS < 0 || (s.P95MS == 0 && s.Refused < 0) {
			gain = append(gain, text)
		} else {
			lose = append(lose, text)
		}
	}
	const most = 5
	if len(gain) > 0 {
		fmt.Fprintf(w, "gain: %s\n", strings.Join(gain[:min(most, len(gain))], ", "))
	}
	if len(lose) > 0 {
		slices.Reverse(lose)
		fmt.Fprintf(w, "lose: %s\n", strings.Join(lose[:min(most, len(lose))], ", "))
	}
	return nil
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func changeText(ch map[string]json.RawMessage) string {
	if len(ch) == 0 {
		return "none (both columns are the configuration in force)"
	}
	keys := make([]string, 0, len(ch))
	for k := range ch {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + string(ch[k])
	}
	return strings.Join(parts, " ")
}

// spark draws depths as a line of block characters scaled to top.
func spark(ds []int, top int) string {
	const bars = "▁▂▃▄▅▆▇█"
	rs := []rune(bars)
	if top == 0 {
		return strings.Repeat(string(rs[0]), len(ds))
	}
	var b strings.Builder
	for _, d := range ds {
		b.WriteRune(rs[min(len(rs)-1, d*(len(rs)-1)/top)])
	}
	return b.String()
}

package firecracker

// This file holds a stand-in for Firecracker's API server. It checks every
// request against the API description Firecracker publishes
// (src/firecracker/swagger/firecracker.yaml): method and path, required
// fields, field types, enums and ranges, and it rejects unknown fields as
// Firecracker does. It also keeps the VMM's state machine (pre-boot only
// calls, pause before snapshot, load only on a fresh process) so the
// driver's call order is exercised. The same server runs in-process for
// client tests and as a child process standing in for the firecracker (and
// jailer) executable in driver tests; see TestMain.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/vmm"
)

// kind is a JSON value type in the API description.
type kind int

const (
	kString kind = iota
	kBool
	kInt
	kObject    // nested schema in field.obj
	kStrings   // array of strings
	kObjects   // array of field.obj
	kAnyObject // free-form JSON object
)

type field struct {
	kind     kind
	required bool
	enum     []string
	min, max *int64
	obj      schema
}

type schema map[string]field

func ptr(v int64) *int64 { return &v }

// Definitions transcribed from the published API description.
var (
	tokenBucket = schema{
		"size":           {kind: kInt, required: true, min: ptr(0)},
		"one_time_burst": {kind: kInt, min: ptr(0)},
		"refill_time":    {kind: kInt, required: true, min: ptr(0)},
	}
	rateLimiter = schema{
		"bandwidth": {kind: kObject, obj: tokenBucket},
		"ops":       {kind: kObject, obj: tokenBucket},
	}
	specLogger = schema{
		"level":           {kind: kString, enum: []string{"Error", "Warning", "Info", "Debug", "Trace", "Off"}},
		"log_path":        {kind: kString},
		"show_level":      {kind: kBool},
		"show_log_origin": {kind: kBool},
		"module":          {kind: kString},
	}
	specMetrics = schema{"metrics_path": {kind: kString, required: true}}
	specMachine = schema{
		"cpu_template":      {kind: kString, enum: []string{"C3", "T2", "T2S", "T2CL", "T2A", "V1N1", "None"}},
		"smt":               {kind: kBool},
		"mem_size_mib":      {kind: kInt, required: true},
		"track_dirty_pages": {kind: kBool},
		"vcpu_count":        {kind: kInt, required: true, min: ptr(1), max: ptr(32)},
		"huge_pages":        {kind: kString, enum: []string{"None", "Transparent", "2M"}},
	}
	specBootSource = schema{
		"boot_args":         {kind: kString},
		"initrd_path":       {kind: kString},
		"kernel_image_path": {kind: kString, required: true},
	}
	specDrive = schema{
		"drive_id":       {kind: kString, required: true},
		"partuuid":       {kind: kString},
		"is_root_device": {kind: kBool, required: true},
		"cache_type":     {kind: kString, enum: []string{"Unsafe", "Writeback"}},
		"is_read_only":   {kind: kBool},
		"path_on_host":   {kind: kString},
		"rate_limiter":   {kind: kObject, obj: rateLimiter},
		"io_engine":      {kind: kString, enum: []string{"Sync", "Async"}},
		"socket":         {kind: kString},
	}
	specPartialDrive = schema{
		"drive_id":     {kind: kString, required: true},
		"path_on_host": {kind: kString},
		"rate_limiter": {kind: kObject, obj: rateLimiter},
	}
	specNIC = schema{
		"guest_mac":       {kind: kString},
		"host_dev_name":   {kind: kString, required: true},
		"iface_id":        {kind: kString, required: true},
		"mtu":             {kind: kInt, min: ptr(68), max: ptr(65535)},
		"rx_rate_limiter": {kind: kObject, obj: rateLimiter},
		"tx_rate_limiter": {kind: kObject, obj: rateLimiter},
	}
	specBalloon = schema{
		"amount_mib":               {kind: kInt, required: true},
		"deflate_on_oom":           {kind: kBool, required: true},
		"stats_polling_interval_s": {kind: kInt},
		"free_page_hinting":        {kind: kBool},
		"free_page_reporting":      {kind: kBool},
	}
	specBalloonUpdate = schema{"amount_mib": {kind: kInt, required: true}}
	specMMDSConfig    = schema{
		"version":            {kind: kString, enum: []string{"V1", "V2"}},
		"network_interfaces": {kind: kStrings, required: true},
		"ipv4_address":       {kind: kString},
		"imds_compat":        {kind: kBool},
	}
	specAction = schema{"action_type": {kind: kString, required: true, enum: []string{"FlushMetrics", "InstanceStart", "SendCtrlAltDel"}}}
	specVM     = schema{"state": {kind: kString, required: true, enum: []string{"Paused", "Resumed"}}}
	specCreate = schema{
		"mem_file_path": {kind: kString, required: true},
		"snapshot_path": {kind: kString, required: true},
		"snapshot_type": {kind: kString, enum: []string{"Full", "Diff"}},
	}
	specLoad = schema{
		"enable_diff_snapshots": {kind: kBool},
		"track_dirty_pages":     {kind: kBool},
		"mem_file_path":         {kind: kString},
		"mem_backend": {kind: kObject, obj: schema{
			"backend_type": {kind: kString, required: true, enum: []string{"File", "Uffd"}},
			"backend_path": {kind: kString, required: true},
		}},
		"snapshot_path": {kind: kString, required: true},
		"resume_vm":     {kind: kBool},
		"network_overrides": {kind: kObjects, obj: schema{
			"iface_id":      {kind: kString, required: true},
			"host_dev_name": {kind: kString, required: true},
		}},
		"vsock_override": {kind: kObject, obj: schema{"uds_path": {kind: kString, required: true}}},
		"clock_realtime": {kind: kBool},
	}
)

// check validates a decoded JSON object against s; the error names the
// offending field.
func (s schema) check(prefix string, v map[string]any) error {
	for name, val := range v {
		f, ok := s[name]
		if !ok {
			return fmt.Errorf("unknown field %s%s", prefix, name)
		}
		if err := f.check(prefix+name, val); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s)) {
		if _, ok := v[name]; s[name].required && !ok {
			return fmt.Errorf("missing required field %s%s", prefix, name)
		}
	}
	return nil
}

func (f field) check(name string, val any) error {
	switch f.kind {
	case kString:
		s, ok := val.(string)
		if !ok {
			return fmt.Errorf("field %s: want a string, got %T", name, val)
		}
		if f.enum != nil && !slices.Contains(f.enum, s) {
			return fmt.Errorf("field %s: %q is not one of %v", name, s, f.enum)
		}
	case kBool:
		if _, ok := val.(bool); !ok {
			return fmt.Errorf("field %s: want a boolean, got %T", name, val)
		}
	case kInt:
		n, ok := val.(float64)
		if !ok || n != float64(int64(n)) {
			return fmt.Errorf("field %s: want an integer, got %v", name, val)
		}
		if f.min != nil && int64(n) < *f.min || f.max != nil && int64(n) > *f.max {
			return fmt.Errorf("field %s: %v out of range", name, n)
		}
	case kObject, kAnyObject:
		o, ok := val.(map[string]any)
		if !ok {
			return fmt.Errorf("field %s: want an object, got %T", name, val)
		}
		if f.kind == kObject {
			return f.obj.check(name+".", o)
		}
	case kStrings, kObjects:
		arr, ok := val.([]any)
		if !ok {
			return fmt.Errorf("field %s: want an array, got %T", name, val)
		}
		for i, el := range arr {
			elField := field{kind: kString}
			if f.kind == kObjects {
				elField = field{kind: kObject, obj: f.obj}
			}
			if err := elField.check(fmt.Sprintf("%s[%d]", name, i), el); err != nil {
				return err
			}
		}
	}
	return nil
}

// call is one request the fake received.
type call struct {
	Method string         `json:"method"`
	Path   string         `json:"path"`
	Body   map[string]any `json:"body,omitempty"`
	Status int            `json:"status"`
	Fault  string         `json:"fault,omitempty"`
}

// fakeState is what a fake "snapshot" state file holds.
type fakeState struct {
	Machine map[string]any            `json:"machine"`
	Drives  map[string]map[string]any `json:"drives"`
	NICs    map[string]map[string]any `json:"nics"`
	Balloon map[string]any            `json:"balloon,omitempty"`
}

// fakeVMM is the fake API server and the VMM state behind it.
type fakeVMM struct {
	root    string    // chroot prefix for paths in requests ("" = none)
	console io.Writer // the guest's serial port
	dieOn   string    // "InstanceStart": exit instead of starting
	// openTaps attaches to each NIC's tap by name, as Firecracker does.
	openTaps bool
	taps     []*os.File
	exit     func(code int)

	mu         sync.Mutex
	calls      []call
	logPath    string // append calls as JSON lines here, if set
	configured bool   // anything but logger/metrics was set
	loggerSet  bool
	started    bool
	paused     bool
	track      bool
	bootSource map[string]any
	state      fakeState
	mmds       map[string]any
}

func newFakeVMM(root string, console io.Writer) *fakeVMM {
	return &fakeVMM{
		root: root, console: console, exit: os.Exit,
		state: fakeState{Drives: map[string]map[string]any{}, NICs: map[string]map[string]any{}},
	}
}

// faultError is an API error answer.
type faultError struct {
	code int
	msg  string
}

func (e *faultError) Error() string { return e.msg }

func bad(format string, a ...any) error {
	return &faultError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

func (f *fakeVMM) host(p string) string {
	if f.root == "" {
		return p
	}
	return filepath.Join(f.root, p)
}

func (f *fakeVMM) mustExist(what, p string) error {
	if _, err := os.Stat(f.host(p)); err != nil {
		return bad("%s %s: %v", what, p, err)
	}
	return nil
}

func (f *fakeVMM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	raw, _ := io.ReadAll(r.Body)
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &body); err != nil {
			f.answer(w, r, nil, nil, bad("spec: body is not a JSON object: %v", err))
			return
		}
	}
	f.mu.Lock()
	out, err := f.route(r.Method, r.URL.Path, body, raw)
	f.mu.Unlock()
	f.answer(w, r, body, out, err)
}

func (f *fakeVMM) answer(w http.ResponseWriter, r *http.Request, body map[string]any, out any, err error) {
	c := call{Method: r.Method, Path: r.URL.Path, Body: body, Status: http.StatusNoContent}
	w.Header().Set("Content-Type", "application/json")
	switch {
	case err != nil:
		var fe *faultError
		c.Status = http.StatusInternalServerError
		if errors.As(err, &fe) {
			c.Status = fe.code
		}
		c.Fault = err.Error()
		w.WriteHeader(c.Status)
		_ = json.NewEncoder(w).Encode(map[string]string{"fault_message": c.Fault})
	case out != nil:
		c.Status = http.StatusOK
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(out)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
	f.record(c)
}

func (f *fakeVMM) record(c call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	if f.logPath == "" {
		return
	}
	b, _ := json.Marshal(c)
	if lf, err := os.OpenFile(f.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		_, _ = lf.Write(append(b, '\n'))
		_ = lf.Close()
	}
}

func (f *fakeVMM) recorded() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// route dispatches by method and path, checks the body against the schema
// of that operation, then applies it.
func (f *fakeVMM) route(method, path string, body map[string]any, raw []byte) (any, error) {
	type op struct {
		method, prefix string
		spec           schema
		bodyRequired   bool
		apply          func(id string, body map[string]any) (any, error)
	}
	routes := []op{
		{"GET", "/", nil, false, f.describe},
		{"PUT", "/logger", specLogger, true, f.putLogger},
		{"PUT", "/metrics", specMetrics, true, f.preStart("metrics", nil)},
		{"PUT", "/machine-config", specMachine, false, f.preStart("machine", f.setMachine)},
		{"PUT", "/boot-source", specBootSource, true, f.preStart("boot", f.setBoot)},
		{"PUT", "/drives/", specDrive, true, f.preStart("drive", f.setDrive)},
		{"PATCH", "/drives/", specPartialDrive, true, f.patchDrive},
		{"PUT", "/network-interfaces/", specNIC, true, f.preStart("nic", f.setNIC)},
		{"PUT", "/balloon", specBalloon, true, f.preStart("balloon", f.setBalloon)},
		{"PATCH", "/balloon", specBalloonUpdate, true, f.patchBalloon},
		{"GET", "/balloon/statistics", nil, false, f.balloonStats},
		{"PUT", "/mmds/config", specMMDSConfig, true, f.preStart("mmds", f.setMMDSConfig)},
		{"PUT", "/mmds", nil, false, f.putMMDS},
		{"PATCH", "/mmds", nil, false, f.patchMMDS},
		{"GET", "/mmds", nil, false, f.getMMDS},
		{"PUT", "/actions", specAction, true, f.doAction},
		{"PATCH", "/vm", specVM, true, f.patchVM},
		{"PUT", "/snapshot/create", specCreate, true, f.createSnapshot},
		{"PUT", "/snapshot/load", specLoad, true, f.loadSnapshot},
	}
	for _, o := range routes {
		id, ok := matchPath(o.prefix, path)
		if !ok {
			continue
		}
		if method != o.method {
			if slices.ContainsFunc(routes, func(x op) bool { _, m := matchPath(x.prefix, path); return m && x.method == method }) {
				continue
			}
			return nil, &faultError{code: http.StatusMethodNotAllowed, msg: fmt.Sprintf("spec: %s %s is not an operation", method, path)}
		}
		if o.bodyRequired && body == nil {
			return nil, bad("spec: %s %s needs a body", method, path)
		}
		if o.spec != nil && body != nil {
			if err := o.spec.check("", body); err != nil {
				return nil, bad("spec: %s %s: %v", method, path, err)
			}
		}
		return o.apply(id, body)
	}
	return nil, &faultError{code: http.StatusNotFound, msg: fmt.Sprintf("spec: no path %s", path)}
}

// matchPath matches "/drives/" style prefixes (one path parameter) and
// exact paths.
func matchPath(prefix, path string) (string, bool) {
	if strings.HasSuffix(prefix, "/") && prefix != "/" {
		id, ok := strings.CutPrefix(path, prefix)
		return id, ok && id != "" && !strings.Contains(id, "/")
	}
	return "", path == prefix
}

func (f *fakeVMM) preStart(what string, apply func(string, map[string]any) error) func(string, map[string]any) (any, error) {
	return func(id string, body map[string]any) (any, error) {
		if f.started {
			return nil, bad("The requested operation is not supported after starting the microVM (%s).", what)
		}
		if what != "metrics" {
			f.configured = true
		}
		if apply == nil {
			return nil, nil
		}
		return nil, apply(id, body)
	}
}

func (f *fakeVMM) describe(string, map[string]any) (any, error) {
	state := "Not started"
	switch {
	case f.started && f.paused:
		state = "Paused"
	case f.started:
		state = "Running"
	}
	return map[string]any{"app_name": "Firecracker", "id": "fake", "state": state, "vmm_version": "0.0.0-fake"}, nil
}

func (f *fakeVMM) putLogger(_ string, body map[string]any) (any, error) {
	if f.loggerSet {
		return nil, bad("Reinitialization of logger not allowed.")
	}
	if p, ok := body["log_path"].(string); ok {
		if err := f.mustExist("log_path", p); err != nil {
			return nil, err
		}
	}
	f.loggerSet = true
	return nil, nil
}

func (f *fakeVMM) setMachine(_ string, body map[string]any) error {
	f.state.Machine = body
	f.track, _ = body["track_dirty_pages"].(bool)
	return nil
}

func (f *fakeVMM) setBoot(_ string, body map[string]any) error {
	if err := f.mustExist("kernel", body["kernel_image_path"].(string)); err != nil {
		return err
	}
	if p, ok := body["initrd_path"].(string); ok {
		if err := f.mustExist("initrd", p); err != nil {
			return err
		}
	}
	f.bootSource = body
	return nil
}

func (f *fakeVMM) setDrive(id string, body map[string]any) error {
	if body["drive_id"] != id {
		return bad("The id from the path [%s] does not match the id from the body [%v]!", id, body["drive_id"])
	}
	p, ok := body["path_on_host"].(string)
	if !ok {
		return bad("drive %s: path_on_host is required for virtio-block", id)
	}
	if _, ok := body["is_read_only"]; !ok {
		return bad("drive %s: is_read_only is required for virtio-block", id)
	}
	if st, err := os.Stat(f.host(p)); err != nil {
		return bad("drive %s: %v", id, err)
	} else if st.IsDir() {
		return bad("Unable to create the block device: open %s: Is a directory", p)
	}
	f.state.Drives[id] = body
	return nil
}

func (f *fakeVMM) patchDrive(id string, body map[string]any) (any, error) {
	if !f.started {
		return nil, bad("The requested operation is not supported before starting the microVM.")
	}
	if body["drive_id"] != id {
		return nil, bad("The id from the path [%s] does not match the id from the body [%v]!", id, body["drive_id"])
	}
	d, ok := f.state.Drives[id]
	if !ok {
		return nil, bad("drive %s not found", id)
	}
	if p, ok := body["path_on_host"].(string); ok {
		if err := f.mustExist("drive "+id, p); err != nil {
			return nil, err
		}
		d["path_on_host"] = p
	}
	return nil, nil
}

func (f *fakeVMM) setNIC(id string, body map[string]any) error {
	if body["iface_id"] != id {
		return bad("The id from the path [%s] does not match the id from the body [%v]!", id, body["iface_id"])
	}
	if f.openTaps {
		// Attach to the tap as Firecracker does, and keep it: a tap someone
		// else still holds answers EBUSY.
		tap, err := vmm.OpenTap(body["host_dev_name"].(string))
		if err != nil {
			return bad("Open tap device failed: %v", err)
		}
		f.taps = append(f.taps, tap)
	}
	f.state.NICs[id] = body
	return nil
}

func (f *fakeVMM) setBalloon(_ string, body map[string]any) error {
	f.state.Balloon = body
	return nil
}

func (f *fakeVMM) patchBalloon(_ string, body map[string]any) (any, error) {
	if f.state.Balloon == nil {
		return nil, bad("balloon device not configured")
	}
	f.state.Balloon["amount_mib"] = body["amount_mib"]
	return nil, nil
}

func (f *fakeVMM) balloonStats(string, map[string]any) (any, error) {
	if f.state.Balloon == nil || f.state.Balloon["stats_polling_interval_s"] == nil {
		return nil, bad("balloon statistics are not enabled")
	}
	amount := f.state.Balloon["amount_mib"]
	return map[string]any{"target_pages": 0, "actual_pages": 0, "target_mib": amount, "actual_mib": amount}, nil
}

func (f *fakeVMM) setMMDSConfig(_ string, body map[string]any) error {
	for _, n := range body["network_interfaces"].([]any) {
		if _, ok := f.state.NICs[n.(string)]; !ok {
			return bad("mmds: network interface %v does not exist", n)
		}
	}
	return nil
}

func (f *fakeVMM) putMMDS(_ string, body map[string]any) (any, error) {
	f.mmds = body
	return nil, nil
}

func (f *fakeVMM) patchMMDS(_ string, body map[string]any) (any, error) {
	if f.mmds == nil {
		f.mmds = map[string]any{}
	}
	maps.Copy(f.mmds, body)
	return nil, nil
}

func (f *fakeVMM) getMMDS(string, map[string]any) (any, error) {
	if f.mmds == nil {
		return nil, &faultError{code: http.StatusNotFound, msg: "The MMDS data store content can not be found."}
	}
	return f.mmds, nil
}

func (f *fakeVMM) doAction(_ string, body map[string]any) (any, error) {
	switch body["action_type"] {
	case "FlushMetrics":
		return nil, nil
	case "SendCtrlAltDel":
		if !f.started {
			return nil, bad("The requested operation is not supported before starting the microVM.")
		}
		// The guest reboots; with reboot=k that ends the VMM, cleanly.
		fmt.Fprintln(f.console, "fake guest: reboot: Restarting system")
		go func() { time.Sleep(20 * time.Millisecond); f.exit(0) }()
		return nil, nil
	}
	if f.started {
		return nil, bad("The microVM is already running.")
	}
	if f.bootSource == nil {
		return nil, bad("Cannot start microvm without kernel configuration.")
	}
	if f.dieOn == "InstanceStart" {
		fmt.Fprintln(os.Stderr, "fake firecracker: fatal: cannot create VM: KVM_CREATE_VM failed")
		f.exit(4)
	}
	f.started = true
	fmt.Fprintln(f.console, "fake guest: Linux version 0.0.0 booting")
	return nil, nil
}

func (f *fakeVMM) patchVM(_ string, body map[string]any) (any, error) {
	if !f.started {
		return nil, bad("The requested operation is not supported before starting the microVM.")
	}
	f.paused = body["state"] == "Paused"
	return nil, nil
}

func (f *fakeVMM) createSnapshot(_ string, body map[string]any) (any, error) {
	if !f.started {
		return nil, bad("The requested operation is not supported before starting the microVM.")
	}
	if !f.paused {
		return nil, bad("Cannot create a snapshot of a running microVM: pause it first.")
	}
	if body["snapshot_type"] == "Diff" && !f.track {
		return nil, bad("Diff snapshots require dirty page tracking.")
	}
	st, err := json.Marshal(f.state)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(f.host(body["snapshot_path"].(string)), st, 0o600); err != nil {
		return nil, bad("snapshot state: %v", err)
	}
	mem, err := os.Create(f.host(body["mem_file_path"].(string)))
	if err != nil {
		return nil, bad("snapshot memory: %v", err)
	}
	defer mem.Close()
	mib, _ := f.state.Machine["mem_size_mib"].(float64)
	if err := mem.Truncate(int64(mib) << 20); err != nil {
		return nil, err
	}
	// A recognisable first page, so tests can see which file was mapped.
	_, err = mem.WriteAt([]byte("fake guest memory"), 0)
	return nil, err
}

func (f *fakeVMM) loadSnapshot(_ string, body map[string]any) (any, error) {
	if f.started || f.configured {
		return nil, bad("Loading a microVM snapshot not allowed after configuring boot-specific resources.")
	}
	_, hasFile := body["mem_file_path"]
	backend, hasBackend := body["mem_backend"].(map[string]any)
	if hasFile == hasBackend {
		return nil, bad("spec: exactly one of mem_file_path and mem_backend must be present")
	}
	memPath, _ := body["mem_file_path"].(string)
	if hasBackend {
		memPath = backend["backend_path"].(string)
	}
	raw, err := os.ReadFile(f.host(body["snapshot_path"].(string)))
	if err != nil {
		return nil, bad("Load snapshot error: %v", err)
	}
	var st fakeState
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, bad("Load snapshot error: bad state file: %v", err)
	}
	mi, err := os.Stat(f.host(memPath))
	if err != nil {
		return nil, bad("Load snapshot error: memory file: %v", err)
	}
	if mib, _ := st.Machine["mem_size_mib"].(float64); mi.Size() != int64(mib)<<20 {
		return nil, bad("Load snapshot error: memory file is %d bytes, guest has %v MiB", mi.Size(), mib)
	}
	for id, d := range st.Drives {
		if err := f.mustExist("Load snapshot error: drive "+id, d["path_on_host"].(string)); err != nil {
			return nil, err
		}
	}
	overrides, _ := body["network_overrides"].([]any)
	for _, o := range overrides {
		o := o.(map[string]any)
		nic, ok := st.NICs[o["iface_id"].(string)]
		if !ok {
			return nil, bad("Load snapshot error: network override of unknown interface %v", o["iface_id"])
		}
		nic["host_dev_name"] = o["host_dev_name"]
	}
	f.state = st
	f.track, _ = body["enable_diff_snapshots"].(bool)
	if t, ok := body["track_dirty_pages"].(bool); ok {
		f.track = t
	}
	f.started = true
	f.paused = body["resume_vm"] != true
	return nil, nil
}

// serveFake serves f on a Unix socket at path until the listener closes.
func serveFake(path string, f *fakeVMM) (*http.Server, net.Listener, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: f}
	go func() { _ = srv.Serve(ln) }()
	return srv, ln, nil
}

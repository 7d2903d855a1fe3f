//! The classroom's pages: the sign-in form, a learner's terminal and map, the instructor's
//! overview. Plain HTML and script, no third-party code but term.js (from Debian).

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const STYLE: &str = r#"<style>
body{font-family:system-ui,sans-serif;margin:0;background:#f4f6f8;color:#1d2733}
header{background:#1d3557;color:#fff;padding:8px 16px;display:flex;justify-content:space-between;align-items:center}
header form{margin:0} button{cursor:pointer}
main{display:flex;gap:12px;padding:12px}
#term{background:#000;padding:6px;border-radius:6px;min-width:660px}
#map{flex:1;display:grid;grid-template-columns:1fr 1fr;gap:10px;align-content:start}
.box{background:#fff;border:1px solid #c9d3dd;border-radius:6px;padding:8px}
.box h3{margin:0 0 6px 0;font-size:14px;color:#1d3557}
.item{font-size:12px;margin:3px 0;padding:3px 6px;border-radius:4px;background:#eef3f7}
.ok{border-left:4px solid #2a9d8f}.bad{border-left:4px solid #e76f51}
.node{border:1px solid #9fb3c8;border-radius:5px;padding:5px;margin:5px 0}
.pod{display:inline-block;font-size:11px;margin:2px;padding:2px 5px;border-radius:3px;background:#dbe9f6}
.arrow{color:#6c7a89} table{border-collapse:collapse;background:#fff} td,th{border:1px solid #c9d3dd;padding:6px 10px;font-size:13px}
.signin{max-width:320px;margin:80px auto;background:#fff;padding:24px;border-radius:8px;border:1px solid #c9d3dd}
.signin input{width:100%;margin:6px 0 12px;padding:6px;box-sizing:border-box}.error{color:#b00020}
</style>"#;

/// The sign-in form, with `error` when the last attempt failed.
pub fn signin(error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"error\">{}</p>", escape(e)))
        .unwrap_or_default();
    format!(
        r#"<!doctype html><html><head><meta charset="utf-8"><title>kumo classroom</title>{STYLE}</head><body>
<div class="signin"><h2>kumo classroom</h2>{error}
<form method="post" action="/signin">
<label>User name<input name="user" autocomplete="username" required></label>
<label>Password<input name="password" type="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button></form></div></body></html>"#
    )
}

fn header(user: &str, what: &str) -> String {
    format!(
        r#"<header><div><b>kumo classroom</b> — {}</div><div>{} <form method="post" action="/signout" style="display:inline"><button>Sign out</button></form></div></header>"#,
        escape(what),
        escape(user)
    )
}

/// A learner's page: the terminal and the map of their cluster.
pub fn learner(user: &str) -> String {
    format!(
        r#"<!doctype html><html><head><meta charset="utf-8"><title>kumo classroom: {u}</title>{STYLE}<script src="/term.js"></script></head><body>
{h}
<main><div><div id="status" class="item">Your cluster is being made…</div><div id="term"></div></div>
<div id="map">
<div class="box"><h3>Control plane (leases)</h3><div id="components"></div></div>
<div class="box"><h3>Cluster</h3><div id="cluster"></div></div>
<div class="box" style="grid-column:span 2"><h3>Nodes and their pods</h3><div id="nodes"></div></div>
<div class="box"><h3>Services → EndpointSlices → load balancer</h3><div id="services"></div></div>
<div class="box"><h3>Recent events</h3><div id="events"></div></div>
</div></main>
<script>
function esc(s){{return String(s==null?'':s).replace(/[&<>"]/g,function(c){{return {{'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}}[c];}});}}
var term=null, ws=null;
function openTerminal(){{
  if(ws) return;
  term=new Terminal({{cols:100,rows:32,useStyle:true,screenKeys:true}});
  term.open(document.getElementById('term'));
  ws=new WebSocket('wss://'+location.host+'/terminal');
  ws.binaryType='arraybuffer';
  var dec=new TextDecoder();
  ws.onmessage=function(e){{term.write(typeof e.data==='string'?e.data:dec.decode(new Uint8Array(e.data),{{stream:true}}));}};
  ws.onclose=function(){{term.write('\r\n[the terminal closed]\r\n');}};
  term.on('data',function(d){{if(ws.readyState===1) ws.send(d);}});
  window.kumoTerminal={{term:term,ws:ws,send:function(s){{ws.send(s);}}}};
}}
function draw(m){{
  document.getElementById('cluster').innerHTML='<div class="item '+(m.available==='True'?'ok':'bad')+'">Cluster '+esc(m.namespace)+'/'+esc(m.cluster)+': '+esc(m.phase)+', Available '+esc(m.available)+'</div>';
  var ready=m.nodes&&m.nodes.length>0;
  document.getElementById('status').textContent=ready?'Your cluster '+m.cluster+' is ready: kubectl is set up for it.':'Your cluster is being made… ('+m.phase+')';
  if(ready) openTerminal();
  document.getElementById('components').innerHTML=(m.components||[]).map(function(c){{return '<div class="item ok">'+esc(c.name)+' <span class="arrow">held by</span> '+esc(c.holder)+'</div>';}}).join('');
  document.getElementById('nodes').innerHTML=(m.nodes||[]).map(function(n){{return '<div class="node '+(n.ready?'ok':'bad')+'"><b>'+esc(n.name)+'</b> '+(n.controlPlane?'(control plane) ':'')+esc(n.zone)+' <span class="arrow">'+esc(n.providerID)+'</span><br>'+(n.pods||[]).map(function(p){{return '<span class="pod">'+esc(p.namespace)+'/'+esc(p.name)+' '+esc(p.phase)+'</span>';}}).join('')+'</div>';}}).join('');
  document.getElementById('services').innerHTML=(m.services||[]).map(function(s){{return '<div class="item">'+esc(s.namespace)+'/'+esc(s.name)+' '+esc(s.type)+' '+esc(s.clusterIP)+' <span class="arrow">→</span> '+esc(s.endpoints)+' endpoints'+(s.loadBalancer?' <span class="arrow">→</span> LB '+esc(s.loadBalancer):'')+'</div>';}}).join('');
  document.getElementById('events').innerHTML=(m.events||[]).map(function(e){{return '<div class="item '+(e.type==='Normal'?'ok':'bad')+'">'+esc(e.reason)+' '+esc(e.object)+': '+esc(e.message)+'</div>';}}).join('');
}}
// The server sends a new map whenever its watches of the cluster see a change.
function follow(){{var m=new WebSocket('wss://'+location.host+'/map');m.onmessage=function(e){{draw(JSON.parse(e.data));}};m.onclose=function(){{setTimeout(follow,1000);}};}}
follow();
</script></body></html>"#,
        u = escape(user),
        h = header(user, "your cluster"),
    )
}

/// The instructor's page: every learner's cluster.
pub fn instructor(user: &str) -> String {
    format!(
        r#"<!doctype html><html><head><meta charset="utf-8"><title>kumo classroom: instructor</title>{STYLE}</head><body>
{h}<main><div class="box"><h3>The learners' clusters</h3><table id="users"><tr><th>User</th><th>Namespace</th><th>Cluster</th><th>Phase</th><th>Available</th><th>Control plane ready</th><th>Workers ready</th></tr></table></div></main>
<script>
function esc(s){{return String(s==null?'':s).replace(/[&<>"]/g,function(c){{return {{'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}}[c];}});}}
function poll(){{fetch('/api/users',{{credentials:'same-origin'}}).then(function(r){{return r.json();}}).then(function(d){{
  var rows='<tr><th>User</th><th>Namespace</th><th>Cluster</th><th>Phase</th><th>Available</th><th>Control plane ready</th><th>Workers ready</th></tr>';
  d.users.forEach(function(u){{rows+='<tr><td>'+esc(u.user)+'</td><td>'+esc(u.namespace)+'</td><td>'+esc(u.cluster||'—')+'</td><td>'+esc(u.phase)+'</td><td>'+esc(u.available)+'</td><td>'+esc(u.controlPlaneReady)+'</td><td>'+esc(u.workersReady)+'</td></tr>';}});
  document.getElementById('users').innerHTML=rows;}}).catch(function(){{}}).finally(function(){{setTimeout(poll,1000);}});}}
poll();
</script></body></html>"#,
        h = header(user, "instructor"),
    )
}

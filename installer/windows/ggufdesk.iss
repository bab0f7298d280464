; Inno Setup script for the Windows installer, made from the same PyInstaller bundle folder
; (installer/build_bundle.sh on windows-latest writes dist/build/cpu/out/ggufdesk).
; Build: iscc /DAppVersion=0.1.0 /DBundleDir=..\..\dist\build\cpu\out\ggufdesk installer\windows\ggufdesk.iss
; Not run on this project's Linux machines; .github/workflows/release.yml runs it and smoke-tests the result.
#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef BundleDir
  #define BundleDir "..\..\dist\build\cpu\out\ggufdesk"
#endif

[Setup]
AppId={{8C7E1D64-5B0A-4E55-9C2B-6D1F0A3B7E21}
AppName=ggufdesk
AppVersion={#AppVersion}
AppPublisher=ggufdesk developers
DefaultDirName={autopf}\ggufdesk
DefaultGroupName=ggufdesk
DisableProgramGroupPage=yes
PrivilegesRequiredOverridesAllowed=dialog
OutputDir=..\..\dist
OutputBaseFilename=ggufdesk-{#AppVersion}-windows-x86_64-setup
Compression=lzma2/fast
SolidCompression=no
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
UninstallDisplayIcon={app}\ggufdesk-gui.exe

[Files]
; The whole bundle: its own Python, Qt, llama.cpp and (by default) the offline starter model.
Source: "{#BundleDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\ggufdesk"; Filename: "{app}\ggufdesk-gui.exe"
Name: "{autodesktop}\ggufdesk"; Filename: "{app}\ggufdesk-gui.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "Create a desktop shortcut"; Flags: unchecked

[Run]
Filename: "{app}\ggufdesk-gui.exe"; Description: "Start ggufdesk"; Flags: nowait postinstall skipifsilent

; Uninstalling removes {app} only: conversations, models and settings in the user's profile stay.
